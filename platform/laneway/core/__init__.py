"""The request pipeline: one small object per stage, testable without HTTP."""
