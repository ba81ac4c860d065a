"""The arena: byte plumbing, lifetimes and their schedule, packing, recording, the plan and
its reports."""
