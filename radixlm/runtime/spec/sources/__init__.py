"""Draft sources: each proposes drafts for a request (spec/draft.py has the contract)."""
