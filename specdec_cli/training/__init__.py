"""train-draft: the trainer, distillation and the built-in corpus, as a Python API."""
