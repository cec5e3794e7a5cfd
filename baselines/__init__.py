"""Baseline update rules (dense Adam; GaLore and LoRA later) behind the method interface."""
