"""The algorithm a user imports: the update-rule interface, LoGRA, dense Adam, the sketch
kernels, predicted-KL control and the torch-optimizer adapter. Imports torch and nothing else of
the project; `baselines/` builds on it."""
