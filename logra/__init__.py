"""LoGRA reproduction harness: tasks, tiny models, GRPO, update rules, memory, evaluation."""
