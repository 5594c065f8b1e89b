"""How good are the features: the kNN monitor and the linear probe (``knn``, ``probe``, ``scoring``), the
baselines an encoder must beat, transfer to other data sets, the leaderboard across runs."""
