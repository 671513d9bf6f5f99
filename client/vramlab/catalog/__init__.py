"""What the API and the worker both need of the catalog: dtypes, device strings, the model
zoo (presets, hub names, transformers' model_types) and the catalog's error. Standard
library only, so a worker installs without the server; the op catalog itself (entries,
plans, presets) is the server's (app/catalog/)."""
