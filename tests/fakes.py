"""Test doubles shared by the test modules."""

from __future__ import annotations


class Scripted:
    """A fake LLM: scripted outputs in order (the last repeats); an Exception is raised."""

    def __init__(self, *outputs):
        self.outputs = list(outputs)
        self.prompts = []

    def __call__(self, prompt):
        self.prompts.append(prompt)
        out = self.outputs[min(len(self.prompts), len(self.outputs)) - 1]
        if isinstance(out, Exception):
            raise out
        return out
