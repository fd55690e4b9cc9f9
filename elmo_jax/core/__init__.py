"""The pure core: the model's options, spelling (tokens -> character ids), the
vocabulary, the kernels, the biLM, `embed` and the softmax. Imports only
`storage` (to read an options file, a vocabulary, a lexicon) and `errors`."""
