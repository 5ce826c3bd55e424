"""A model version's weights on their way between workers: the weight syncs (`sync`), the
in-memory handover between a trainer and an explorer in one process (`handover`), LoRA
adapters (`adapters`) and the run summary's weights download (`exports`)."""
