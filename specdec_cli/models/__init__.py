"""Loading models (transformers, accelerate, GGUF, GPTQ/AWQ, int4 a layer at a time, packed int4 on
disk), and choosing devices and dtypes."""
