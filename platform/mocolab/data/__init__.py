"""Images in, uint8 batches out: the data sets (``sets``), where a run's images come from (``sources``),
the index of a large split (``image_index``, ``folders``), decoding (``decode``), the data's place on
disk (``roots``), and the two augmented views (``augment``)."""
