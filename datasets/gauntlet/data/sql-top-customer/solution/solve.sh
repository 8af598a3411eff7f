#!/bin/bash
set -e
python3 - <<'EOF'
import sqlite3

db = sqlite3.connect(":memory:")
db.executescript(open("/app/shop.sql").read())
(name,) = db.execute(
    "SELECT c.name FROM customers c JOIN invoices i ON i.customer_id = c.id "
    "WHERE c.country = 'DE' AND i.status = 'paid' GROUP BY c.id ORDER BY sum(i.total) DESC LIMIT 1"
).fetchone()
open("/app/answer.txt", "w").write(name + "\n")
EOF
