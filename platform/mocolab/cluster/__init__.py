"""A Ray cluster with an MLflow server on one machine (``mocolab cluster``): the multi-node topology to
rehearse on before the real one.  Imports Ray and MLflow only as the programs it starts."""

from mocolab.cluster.local import DEFAULT_DIR, LocalCluster, State

__all__ = ["DEFAULT_DIR", "LocalCluster", "State"]
