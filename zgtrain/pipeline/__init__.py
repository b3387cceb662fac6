"""One source for every dvc.yaml, the root project's and each `zg init` scaffold's: the profiles (``profiles``),
the code each stage runs (``code``), the stage graph built from params (``stages``) and the project scaffold
(``scaffold``: `zg init`, `zg pipeline`)."""
