package sqltrap

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// universe is the set of argument types for which traps are made: every type of a column,
// argument or result of schema fencelock (when it exists), and the types a literal or a cast
// in fencelock's SQL has.
const universeSQL = `
WITH named(t) AS (
    SELECT pg_catalog.to_regtype(n) FROM pg_catalog.unnest(ARRAY[
        'smallint', 'integer', 'bigint', 'numeric', 'real', 'double precision', 'text',
        'character varying', 'name', 'boolean', 'interval', 'timestamp with time zone',
        'timestamp without time zone', 'date', 'oid', 'regclass', 'regtype', 'regrole', 'jsonb',
        'json', 'bytea', 'pg_lsn', 'inet', 'xid8', 'bit', 'text[]', 'bigint[]', 'integer[]',
        'name[]', 'oid[]']) AS n
    UNION
    SELECT a.atttypid FROM pg_catalog.pg_attribute AS a JOIN pg_catalog.pg_class AS c ON c.oid = a.attrelid
    WHERE c.relnamespace = pg_catalog.to_regnamespace('fencelock') AND a.attnum > 0 AND NOT a.attisdropped
    UNION
    SELECT pg_catalog.unnest(pg_catalog.array_append(p.proargtypes::oid[], p.prorettype)) FROM pg_catalog.pg_proc AS p
    WHERE p.pronamespace = pg_catalog.to_regnamespace('fencelock')
)
SELECT t.oid, pg_catalog.format_type(t.oid, NULL), t.typelem <> 0 AND t.typlen = -1 AND t.typcategory = 'A'
FROM named JOIN pg_catalog.pg_type AS t ON t.oid = named.t
WHERE t.typtype IN ('b', 'e', 'r') AND t.typisdefined
ORDER BY 1`

func readUniverse(ctx context.Context, conn *pgx.Conn) ([]pgType, error) {
	rows, err := conn.Query(ctx, universeSQL)
	if err != nil {
		return nil, fmt.Errorf("read the type universe: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (pgType, error) {
		var t pgType
		err := r.Scan(&t.oid, &t.name, &t.array)
		return t, err
	})
}

func readImplicitCasts(ctx context.Context, conn *pgx.Conn) (map[[2]uint32]bool, error) {
	rows, err := conn.Query(ctx, `SELECT castsource, casttarget FROM pg_catalog.pg_cast WHERE castcontext = 'i'`)
	if err != nil {
		return nil, fmt.Errorf("read pg_cast: %w", err)
	}
	out := map[[2]uint32]bool{}
	var src, dst uint32
	_, err = pgx.ForEachRow(rows, []any{&src, &dst}, func() error {
		out[[2]uint32{src, dst}] = true
		return nil
	})
	return out, err
}

func readPolymorphic(ctx context.Context, conn *pgx.Conn) (map[uint32]string, error) {
	rows, err := conn.Query(ctx, `SELECT oid, typname FROM pg_catalog.pg_type
		WHERE typnamespace = 'pg_catalog'::regnamespace AND typtype = 'p'
		  AND typname IN ('any', 'anyelement', 'anynonarray', 'anyarray', 'anycompatible',
		                  'anycompatiblenonarray', 'anycompatiblearray')`)
	if err != nil {
		return nil, fmt.Errorf("read polymorphic types: %w", err)
	}
	out := map[uint32]string{}
	var oid uint32
	var name string
	_, err = pgx.ForEachRow(rows, []any{&oid, &name}, func() error {
		out[oid] = name
		return nil
	})
	return out, err
}

// readTypeNames returns every type's name as format_type spells it, and the pseudo-types.
func readTypeNames(ctx context.Context, conn *pgx.Conn) (map[uint32]string, map[uint32]bool, error) {
	rows, err := conn.Query(ctx, `SELECT oid, pg_catalog.format_type(oid, NULL), typtype = 'p' FROM pg_catalog.pg_type`)
	if err != nil {
		return nil, nil, fmt.Errorf("read type names: %w", err)
	}
	names, pseudo := map[uint32]string{}, map[uint32]bool{}
	var oid uint32
	var name string
	var p bool
	_, err = pgx.ForEachRow(rows, []any{&oid, &name, &p}, func() error {
		names[oid] = name
		if p {
			pseudo[oid] = true
		}
		return nil
	})
	return names, pseudo, err
}

func readArrayTypes(ctx context.Context, conn *pgx.Conn) (elemOf, arrayOf map[uint32]uint32, err error) {
	rows, err := conn.Query(ctx, `SELECT oid, typelem FROM pg_catalog.pg_type WHERE typelem <> 0 AND typcategory = 'A' AND typlen = -1`)
	if err != nil {
		return nil, nil, fmt.Errorf("read array types: %w", err)
	}
	elemOf, arrayOf = map[uint32]uint32{}, map[uint32]uint32{}
	var arr, elem uint32
	_, err = pgx.ForEachRow(rows, []any{&arr, &elem}, func() error {
		elemOf[arr], arrayOf[elem] = elem, arr
		return nil
	})
	return elemOf, arrayOf, err
}

// readSignatures returns pg_catalog's operators and functions (plain and aggregate) of names;
// with each type name of names.Types, the functions of that name (a cast written as a call).
func readSignatures(ctx context.Context, conn *pgx.Conn, names Names) ([]signature, error) {
	funcs := append([]string{}, names.Functions...)
	for _, t := range names.Types {
		funcs = append(funcs, t)
	}
	rows, err := conn.Query(ctx, `
		SELECT p.proname::text, p.proargtypes::oid[], p.prorettype, p.proretset, p.prokind::text, p.provariadic
		FROM pg_catalog.pg_proc AS p
		WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.prokind IN ('f', 'a')
		  AND p.proname = ANY ($1::text[])
		  AND NOT EXISTS (SELECT FROM pg_catalog.pg_aggregate AS g WHERE g.aggfnoid = p.oid AND g.aggkind <> 'n')
		UNION ALL
		SELECT o.oprname::text, CASE o.oprkind WHEN 'b' THEN ARRAY[o.oprleft, o.oprright] ELSE ARRAY[o.oprright] END,
		       o.oprresult, false, o.oprkind::text, 0
		FROM pg_catalog.pg_operator AS o
		WHERE o.oprnamespace = 'pg_catalog'::regnamespace AND o.oprname = ANY ($2::text[])
		ORDER BY 1, 2`, funcs, names.Operators)
	if err != nil {
		return nil, fmt.Errorf("read pg_proc and pg_operator: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (signature, error) {
		var s signature
		var kind string
		err := r.Scan(&s.name, &s.args, &s.result, &s.retset, &kind, &s.variadic)
		s.kind = kind[0]
		if len(s.args) == 0 {
			s.variadic = 0
		}
		return s, err
	})
}
