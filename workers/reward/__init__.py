"""Rewards on the workers: the reward queue's task (`scoring`), the model-based scorers it
calls (`scorers`: reward models, LLM judges), the learned reward model's fitting, publishing
and scoring (`trainer`), its kinds (`kinds/`), the likelihood reward model (`likelihood`,
`likelihood_hf`), the log-likelihood features the kinds that read the base share
(`logprob_features`) and the learned K-12 grader (`k12`)."""
