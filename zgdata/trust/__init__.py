"""The checks before anything is read: DVC-tracked inputs against git's ``dvc.lock`` (``dvc_lock``), ``dvc add``ed
inputs against their ``.dvc`` file (``dvc_added``), and safetensors headers before a library parses them."""
