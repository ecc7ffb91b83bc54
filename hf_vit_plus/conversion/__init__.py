"""Pure converters from foreign checkpoints (timm, transformers' ViT, torch.nn.Transformer) to hf_vit_plus."""
