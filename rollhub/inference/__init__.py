"""Model serving: engines, the CPU server speaking SGLang's API, weight sync, model export, chat templates."""
