"""What a user embeds with: `Elmo` (the notebook wrapper), ELMo as a Flax
module (linen and NNX), sentence scores, nearest neighbours, bilm-tf's
stateful dump. Above `core`, `formats` and `data`."""
