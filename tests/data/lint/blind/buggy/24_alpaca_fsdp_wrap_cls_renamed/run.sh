# flag as posted by the reporter (transformers 4.28.1), passed to the torchrun command of stanford_alpaca train.py
--fsdp_transformer_layer_cls_to_wrap "LLaMADecoderLayer"
