"""splitwise_jax: a differentiable analytical model of Splitwise LLM inference clusters."""
