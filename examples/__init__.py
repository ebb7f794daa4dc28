"""The examples, shipped in the wheel as ``pipeswift_examples`` (`pswift init --example NAME` copies one)."""
