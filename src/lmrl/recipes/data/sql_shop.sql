CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL, joined INTEGER NOT NULL);
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, price REAL NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                     product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL, year INTEGER NOT NULL);
INSERT INTO customers VALUES (1, 'Ada', 'London', 2019), (2, 'Bruno', 'Paris', 2020), (3, 'Chen', 'London', 2021),
  (4, 'Dana', 'Berlin', 2020), (5, 'Emil', 'Paris', 2022), (6, 'Fatima', 'Madrid', 2023);
INSERT INTO products VALUES (1, 'pen', 'office', 1.5), (2, 'notebook', 'office', 4.0), (3, 'lamp', 'home', 25.0),
  (4, 'mug', 'home', 8.5), (5, 'chair', 'home', 120.0), (6, 'stapler', 'office', 12.0), (7, 'rug', 'home', 60.0),
  (8, 'desk', 'office', 95.0);
INSERT INTO orders VALUES (1, 1, 1, 10, 2022), (2, 1, 3, 1, 2023), (3, 2, 2, 5, 2022), (4, 2, 5, 2, 2023),
  (5, 3, 4, 4, 2023), (6, 3, 1, 20, 2023), (7, 4, 6, 1, 2022), (8, 4, 7, 1, 2023), (9, 5, 2, 3, 2023),
  (10, 1, 4, 2, 2023), (11, 2, 1, 6, 2023), (12, 4, 3, 2, 2022);
