-- Where a run's answer should be delivered (webhook mappings' deliver/channel/to), as JSON;
-- kept with the run for the delivery capability.
ALTER TABLE runs ADD COLUMN delivery TEXT;
