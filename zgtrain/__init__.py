"""zgtrain: students (conversions), objectives, the block trainer, assembly and evaluation."""
