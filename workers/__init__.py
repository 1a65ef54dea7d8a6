"""Entry points of distgrad's processes."""
