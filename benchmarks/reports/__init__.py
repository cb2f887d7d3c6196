"""Reports: tables, pages and claims computed from the results files (no training, seconds to run)."""
