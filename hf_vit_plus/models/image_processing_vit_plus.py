"""Image processor of the ViTPlus family: resize to the model's resolution, convert to RGB (or grey), rescale,
normalise. A thin subclass of transformers' ViT processor so that it is saved with the checkpoint's code and
`AutoImageProcessor.from_pretrained` / `pipeline("image-classification")` work on a saved folder."""

from __future__ import annotations

from transformers.models.vit.image_processing_vit import ViTImageProcessor


class ViTPlusImageProcessor(ViTImageProcessor):
    model_input_names = ["pixel_values"]
    do_convert_rgb = True

    @classmethod
    def from_model_config(cls, config, **kwargs) -> ViTPlusImageProcessor:
        """A processor whose output matches `config` (resolution and channels)."""
        size = {"height": config.image_size, "width": config.image_size}
        if config.num_channels not in (1, 3):
            raise ValueError(
                f"ViTPlusImageProcessor handles 1- or 3-channel images; the config has num_channels="
                f"{config.num_channels}."
            )
        if config.num_channels == 1:
            kwargs.setdefault("do_convert_rgb", False)
            kwargs.setdefault("image_mean", [0.5])
            kwargs.setdefault("image_std", [0.5])
        return cls(size=size, **kwargs)


__all__ = ["ViTPlusImageProcessor"]
