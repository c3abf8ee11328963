-- How many characters of what a run's attempts stored were replaced to make them storable: a
-- NUL, a lone surrogate or a byte that is not UTF-8 became U+FFFD, a NaN in JSON null
-- (promptsched/storable.py; docs/reliability.md, "Isolation of failure"). NULL: none was.
-- A nullable column without a default changes the catalog only (no rewrite, no scan), under
-- the migration's short lock_timeout; the previous release never names it.
ALTER TABLE runs ADD COLUMN cleaned_chars integer;
