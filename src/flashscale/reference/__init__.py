"""Plain-PyTorch versions of every kernel: the test oracle and the CPU path. Clear before fast."""
