CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT NOT NULL);
CREATE TABLE invoices (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL, total REAL NOT NULL, status TEXT NOT NULL);
INSERT INTO customers VALUES (1, 'Acme', 'DE'), (2, 'Globex', 'FR'), (3, 'Initech', 'DE'), (4, 'Umbrella', 'DE');
INSERT INTO invoices VALUES (1, 1, 120.0, 'paid'), (2, 1, 80.0, 'paid'), (3, 3, 150.0, 'paid'),
  (4, 3, 90.0, 'void'), (5, 4, 199.5, 'paid'), (6, 2, 999.0, 'paid'), (7, 4, 0.5, 'paid'), (8, 3, 60.0, 'paid');
