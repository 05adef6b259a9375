"""The types every part shares, below the parts and the models: dimensions (:mod:`.dims`), the
forward context (:mod:`.context`), initialisation marks (:mod:`.init`) and once-a-step state
updates (:mod:`.step_updates`).  Nothing here imports a part, a model, a task or a dataset."""
