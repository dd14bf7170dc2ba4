"""pmkjit: expectation propagation with kernel-based just-in-time message operators for PyMC."""
