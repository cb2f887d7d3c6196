"""Loss functions as pure functions of tensors (ViTCAE eq. 23-25, the CET-ViT EI regulariser)."""
