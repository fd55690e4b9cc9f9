"""Where models come from and how they are written: bilm-tf's hdf5 weights,
the export folder, a workdir's checkpoints, ELMoForManyLangs' folders and the
torch pickles inside them, the registry of published models, downloads, the
hub, and `open_model`, which opens any of them. Above `core` and `config`."""
