"""Message operators: oracles that compute EP messages, and KJIT operators that learn them."""

from pmkjit.operators.importance import ImportanceSamplingOracle
from pmkjit.operators.kjit import KJITOperator, KJITResult
from pmkjit.operators.oracle import OracleResult
from pmkjit.operators.quadrature import QuadratureOracle

__all__ = ["OracleResult", "ImportanceSamplingOracle", "QuadratureOracle", "KJITOperator", "KJITResult"]
