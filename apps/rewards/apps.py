from django.apps import AppConfig


class RewardsConfig(AppConfig):
    name = "apps.rewards"
    label = "rewards"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The run config (apps.runs, below this app) validates reward names and params, and a
        # run's start checks its taskset's domains, through the kernel's vocabulary registry.
        from apps.rewards.registry import domain_routes, reward_names, reward_params_check
        from apps.rewards.scoring import taskset_routing_errors
        from kernel.vocabulary import rewards_register

        rewards_register(names=reward_names,
                         params_check=lambda name, params: reward_params_check(name=name, params=params),
                         taskset_check=taskset_routing_errors,
                         domain_names=lambda: list(domain_routes()))
