"""The networks: backbones and heads (``backbones``, ``vision_transformer``, ``pooling``) and what leaves
the platform as a model (``exported``)."""
