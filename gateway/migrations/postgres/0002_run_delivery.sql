-- Where a background run's answer goes (webhook runs): see sqlite/0002_run_delivery.sql.
ALTER TABLE runs ADD COLUMN delivery TEXT;
