"""Images in, uint8 batches out: the data sets by name (``sets``; each set's loader: ``fashion_mnist`` with
``idx``, ``torchvision_sets``, ``indexed_sets``, ``synthetic``; all return an ``image_dataset``) and their
per-rank batch order (``batching``), where a run's images come from (``sources``), the files of a large split
(``image_index``, ``image_folders``), decoding (``decode``), the data's place on disk (``roots``), and the two
augmented views (``augment``)."""
