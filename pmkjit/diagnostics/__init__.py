"""Warnings that name what EP is known to get wrong in a model (:mod:`.model`) or a fit (:mod:`.posterior`)."""
