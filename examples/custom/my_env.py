"""A custom environment, as README_VLMRL.md shows it: the model may answer again after a wrong answer."""

from verl_mm_tools.envs import Environment, Observation


class RetryEnv(Environment):
    name = "retry"  # selectable by class path (my_env.RetryEnv) without registering it

    def reset(self, sample):  # sample.ground_truth, .extra_info, .images (ids 1..n)
        self.truth = str(sample.ground_truth)

    def step(self, assistant_text):  # -> (observation, reward, done, info); may be async
        right = f"<answer>{self.truth}</answer>" in assistant_text
        return Observation(text="" if right else "That is not it. Look again and answer."), float(right), right, {}
