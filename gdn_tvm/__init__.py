"""gdn_tvm: the decode-step kernels of Gated DeltaNet hybrid LLMs in Apache TVM TensorIR."""

__version__ = "0.1.0"
