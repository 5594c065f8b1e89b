"""Training a run: the plain-PyTorch loop (``trainer``, built by ``build``, watched by ``monitors``) and
Ray Train around it (``launch`` on the driver, ``worker`` on each rank), with checkpoints and restarts: where
a run keeps its state (``storage``), the code that trains it (``code_fingerprint``) and what the same command
does when run again (``rerun``).
``fit`` loads on first use, so the loop itself imports no Ray."""

__all__ = ["TrainOutcome", "fit"]


def __getattr__(name: str):
    if name in __all__:
        from mocolab.training import launch

        return getattr(launch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
