-- 003_reserved.sql: schema version 3 is another change's (an owner_uid column on runs, made beside
-- this one); this file holds its number so that 004_layout.sql keeps its own. It changes nothing.
-- When the two changes meet, this file gives way to that migration (schema/CMakeLists.txt lists
-- it) and 004_layout.sql stays as it is: neither touches what the other adds.
SELECT 1;
