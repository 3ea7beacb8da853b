// Package sqltrap builds a trap for SQL that a caller's search_path could redirect, for the
// tests that show fencelock's SQL never runs another role's code (issue 38; the class of
// CVE-2018-1058).
//
// PostgreSQL resolves an operator or a function along the search_path, with pg_catalog
// implicitly first, and prefers a candidate whose argument types match exactly in any schema
// over one of pg_catalog that needs an implicit cast. So where pg_catalog has no exact match
// (bigint * interval, numeric > integer, count(boolean), unnest(text[]), format(text, bigint)),
// a role with CREATE on a schema of the caller's search_path can plant an exact one, and the
// caller runs it with the caller's privileges.
//
// [Scan] lists the operator, function and type names a set of SQL texts uses; [Generate]
// reads pg_catalog and writes, for each of those names, an object of schema [Schema] for
// every argument-type combination (over the types fencelock's SQL handles) that an existing
// pg_catalog object accepts only through an implicit cast, or through a polymorphic
// parameter: exactly the objects an attacker would plant. Each trap raises SQLSTATE
// [SQLState] when it runs, and is a SQL function that the planner inlines, so the statement's
// plan shows the sentinel call ([Sentinel]) even where no row makes it run: [Check] prepares
// a statement, EXPLAINs its generic plan and looks for it, then runs it in a transaction that
// it rolls back.
//
// Nothing here is written by hand per operator or function: the list comes from the SQL and
// the catalog, so a new statement that needs an implicit cast meets a trap of its own.
package sqltrap

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Schema is the trap schema's name; a test puts it first on the search_path.
const Schema = "fencelock_trap"

// SQLState is the SQLSTATE a trap raises when it runs.
const SQLState = "FLTRP"

// Sentinel is the name of the function every trap calls: a plan that names it resolved a trap.
const Sentinel = "fencelock_trap_called"

// Names are the operator, function and type names that some SQL texts use.
type Names struct {
	Operators []string // operator names, such as "*" and "||"
	Functions []string // function and aggregate names, unqualified, lower case
	Types     []string // the type names of casts (x::name, CAST(x AS name)), lower case
}

var (
	reComment   = regexp.MustCompile(`(?s)--[^\n]*|/\*.*?\*/`)
	reString    = regexp.MustCompile(`(?s)[eE]?'(?:[^']|'')*'`)
	reQuotedID  = regexp.MustCompile(`"(?:[^"]|"")*"`)
	reFunction  = regexp.MustCompile(`(?i)(^|[^.\w$])([a-z_][a-z0-9_]*)\s*\(`)
	reOperator  = regexp.MustCompile("[-+*/<>=~!@#%^&|`?]+")
	reCast      = regexp.MustCompile(`(?i)::\s*([a-z_][a-z0-9_]*(?:\s+(?:precision|varying|with(?:out)?\s+time\s+zone))?)`)
	reCastAs    = regexp.MustCompile(`(?i)\bAS\s+([a-z_][a-z0-9_]*(?:\s+(?:precision|varying|with(?:out)?\s+time\s+zone))?)\s*\)`)
	reDollarTag = regexp.MustCompile(`\$[A-Za-z_]*\$`)
)

// implicitOperators are operators that SQL's constructs look up by name without spelling
// them: IS DISTINCT FROM, IN, CASE x WHEN, NULLIF (=), NOT IN (<>), BETWEEN (>=, <=), LIKE
// (~~), NOT LIKE (!~~), SIMILAR TO (~).
var implicitOperators = []string{"=", "<>", "<", "<=", ">", ">=", "~~", "!~~", "~"}

// Scan returns the names the SQL texts use: each word followed by "(" that is not schema
// qualified (a qualified call resolves in its schema alone), each run of operator characters,
// each cast's type, and the operators of implicitOperators. String literals and comments are
// skipped; dollar-quoted bodies are scanned as SQL. Names that pg_catalog does not have are
// harmless: Generate ignores them.
func Scan(texts ...string) Names {
	ops := map[string]bool{}
	funcs := map[string]bool{}
	types := map[string]bool{}
	for _, o := range implicitOperators {
		ops[o] = true
	}
	for _, t := range texts {
		t = reDollarTag.ReplaceAllString(t, " ")
		t = reComment.ReplaceAllString(t, " ")
		t = reString.ReplaceAllString(t, " '' ")
		t = reQuotedID.ReplaceAllString(t, " q ")
		for _, m := range reFunction.FindAllStringSubmatch(t, -1) {
			funcs[strings.ToLower(m[2])] = true
		}
		for _, m := range reCast.FindAllStringSubmatch(t, -1) {
			types[strings.ToLower(strings.Join(strings.Fields(m[1]), " "))] = true
		}
		for _, m := range reCastAs.FindAllStringSubmatch(t, -1) {
			types[strings.ToLower(strings.Join(strings.Fields(m[1]), " "))] = true
		}
		// $1, $2: not operators; := and => are PL/pgSQL's and named notation's.
		for _, m := range reOperator.FindAllString(strings.NewReplacer(":=", " ", "=>", " ").Replace(t), -1) {
			ops[m] = true
		}
	}
	return Names{Operators: keys(ops), Functions: keys(funcs), Types: keys(types)}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

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

type pgType struct {
	oid   uint32
	name  string
	array bool
}

type signature struct {
	name     string
	args     []uint32
	result   uint32
	retset   bool
	kind     byte // 'f' function, 'a' aggregate, 'b' binary operator, 'l' prefix operator
	variadic uint32
}

// Generate reads pg_catalog through conn and returns the SQL that creates schema Schema with a
// trap for every argument-type combination, over the type universe, for which a pg_catalog
// operator or function of names accepts the arguments only through an implicit cast or a
// polymorphic parameter, and pg_catalog has no exact match. It also returns how many traps it
// made.
func Generate(ctx context.Context, conn *pgx.Conn, names Names) (string, int, error) {
	universe, err := readUniverse(ctx, conn)
	if err != nil {
		return "", 0, err
	}
	casts, err := readImplicitCasts(ctx, conn)
	if err != nil {
		return "", 0, err
	}
	poly, err := readPolymorphic(ctx, conn)
	if err != nil {
		return "", 0, err
	}
	sigs, err := readSignatures(ctx, conn, names)
	if err != nil {
		return "", 0, err
	}
	exact := map[string]bool{}
	for _, s := range sigs {
		exact[s.key(s.args)] = true
	}
	byOID := map[uint32]pgType{}
	for _, t := range universe {
		byOID[t.oid] = t
	}
	elemOf, arrayOf, err := readArrayTypes(ctx, conn)
	if err != nil {
		return "", 0, err
	}
	typeNames, pseudo, err := readTypeNames(ctx, conn)
	if err != nil {
		return "", 0, err
	}

	// accepts lists the universe's types that pg_catalog takes at a parameter of type p
	// without an exact match: by an implicit cast, or by a polymorphic parameter.
	accepts := func(p uint32) []uint32 {
		var out []uint32
		for _, t := range universe {
			switch poly[p] {
			case "any", "anyelement", "anycompatible":
				out = append(out, t.oid)
			case "anynonarray", "anycompatiblenonarray":
				if !t.array {
					out = append(out, t.oid)
				}
			case "anyarray", "anycompatiblearray":
				if t.array {
					out = append(out, t.oid)
				}
			case "":
				if t.oid == p || casts[[2]uint32{t.oid, p}] {
					out = append(out, t.oid)
				}
			}
		}
		return out
	}

	var b strings.Builder
	fmt.Fprintf(&b, "DROP SCHEMA IF EXISTS %s CASCADE;\nCREATE SCHEMA %s;\n", Schema, Schema)
	fmt.Fprintf(&b, `CREATE FUNCTION %[1]s.%[2]s(label text) RETURNS text LANGUAGE plpgsql STABLE AS $t$
BEGIN
    RAISE EXCEPTION 'fencelock_trap: %% ran: a statement resolved it through the search_path', label
        USING ERRCODE = '%[3]s';
END $t$;
CREATE FUNCTION %[1]s.%[2]s_void(label text) RETURNS void LANGUAGE plpgsql STABLE AS $t$
BEGIN
    PERFORM %[1]s.%[2]s(label);
END $t$;
`, Schema, Sentinel, SQLState)
	made := map[string]bool{}
	n := 0
	for _, s := range sigs {
		params := s.args
		if s.variadic != 0 && len(params) > 0 {
			// Called with the variadic list spread out: one and two arguments in its place.
			fixed := params[:len(params)-1]
			elem := s.variadic
			for extra := 1; extra <= 2; extra++ {
				spread := append(append([]uint32{}, fixed...), repeat(elem, extra)...)
				n += s.emit(&b, spread, accepts, exact, made, poly, byOID, elemOf, arrayOf, typeNames, pseudo)
			}
			continue
		}
		n += s.emit(&b, params, accepts, exact, made, poly, byOID, elemOf, arrayOf, typeNames, pseudo)
	}
	return b.String(), n, nil
}

func repeat(t uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = t
	}
	return out
}

func (s signature) key(args []uint32) string {
	k := string(s.kind)
	if s.kind == 'f' || s.kind == 'a' {
		k = "f"
	}
	return fmt.Sprintf("%s %s %v", k, s.name, args)
}

// emit writes the traps of s for every combination of the types its parameters accept; it
// returns how many it wrote.
func (s signature) emit(b *strings.Builder, params []uint32, accepts func(uint32) []uint32,
	exact, made map[string]bool, poly map[uint32]string, byOID map[uint32]pgType,
	elemOf, arrayOf map[uint32]uint32, typeNames map[uint32]string, pseudoTypes map[uint32]bool) int {
	if len(params) == 0 {
		return 0 // nothing to coerce: pg_catalog's own is exact
	}
	choices := make([][]uint32, len(params))
	for i, p := range params {
		choices[i] = accepts(p)
		if len(choices[i]) == 0 {
			return 0
		}
	}
	n := 0
	combo := make([]uint32, len(params))
	var walk func(i int)
	walk = func(i int) {
		if i < len(params) {
			for _, t := range choices[i] {
				combo[i] = t
				walk(i + 1)
			}
			return
		}
		k := s.key(combo)
		if exact[k] || made[k] {
			return
		}
		result, ok := resolveResult(s.result, params, combo, poly, elemOf, arrayOf)
		if !ok {
			return
		}
		resultName, ok := typeNames[result]
		if !ok || poly[result] != "" {
			return
		}
		if result != voidOID {
			if pseudoTypes[result] {
				return // record, trigger, internal: no trap can stand for it
			}
		}
		made[k] = true
		n++
		s.write(b, n, combo, result, resultName, byOID)
	}
	walk(0)
	return n
}

const voidOID = 2278

// resolveResult returns the result type of a call of s with argument types combo: its declared
// result, or for a polymorphic result the type its polymorphic parameters bind.
func resolveResult(result uint32, params, combo []uint32, poly map[uint32]string, elemOf, arrayOf map[uint32]uint32) (uint32, bool) {
	kind := poly[result]
	if kind == "" {
		return result, true
	}
	var elem uint32
	for i, p := range params {
		switch poly[p] {
		case "anyelement", "anynonarray", "anycompatible", "anycompatiblenonarray":
			elem = combo[i]
		case "anyarray", "anycompatiblearray":
			elem = elemOf[combo[i]]
		default:
			continue
		}
		break
	}
	if elem == 0 {
		return 0, false
	}
	switch kind {
	case "anyelement", "anynonarray", "anycompatible", "anycompatiblenonarray":
		return elem, true
	case "anyarray", "anycompatiblearray":
		a, ok := arrayOf[elem]
		return a, ok
	}
	return 0, false
}

// traps are numbered per signature call; their function names carry the signature's kind and a
// global counter so that no two collide.
var trapSeq int

func (s signature) write(b *strings.Builder, _ int, combo []uint32, result uint32, resultName string, byOID map[uint32]pgType) {
	trapSeq++
	argNames := make([]string, len(combo))
	for i, a := range combo {
		argNames[i] = byOID[a].name
	}
	args := strings.Join(argNames, ", ")
	label := strings.ReplaceAll(fmt.Sprintf("%s %s(%s)", kindWord(s.kind), s.name, args), "'", "''")
	body := func(ret string) string {
		if result == voidOID {
			return fmt.Sprintf("SELECT %s.%s_void('%s')", Schema, Sentinel, label)
		}
		return fmt.Sprintf("SELECT %s.%s('%s')::%s", Schema, Sentinel, label, ret)
	}
	ret := resultName
	if result == voidOID {
		ret = "void"
	}
	switch s.kind {
	case 'f':
		setof := ""
		if s.retset {
			setof = "SETOF "
		}
		fmt.Fprintf(b, "CREATE FUNCTION %s.%s(%s) RETURNS %s%s LANGUAGE sql STABLE AS $t$ %s $t$;\n",
			Schema, pgx.Identifier{s.name}.Sanitize(), args, setof, ret, body(ret))
	case 'a':
		if result == voidOID {
			return
		}
		fmt.Fprintf(b, "CREATE FUNCTION %[1]s.agg_s_%[2]d(text, %[3]s) RETURNS text LANGUAGE sql STABLE AS $t$ SELECT %[1]s.%[4]s('%[5]s') $t$;\n",
			Schema, trapSeq, args, Sentinel, label)
		fmt.Fprintf(b, "CREATE FUNCTION %[1]s.agg_f_%[2]d(text) RETURNS %[3]s LANGUAGE sql STABLE AS $t$ %[4]s $t$;\n",
			Schema, trapSeq, ret, body(ret))
		fmt.Fprintf(b, "CREATE AGGREGATE %[1]s.%[2]s(%[3]s) (SFUNC = %[1]s.agg_s_%[4]d, STYPE = text, FINALFUNC = %[1]s.agg_f_%[4]d);\n",
			Schema, pgx.Identifier{s.name}.Sanitize(), args, trapSeq)
	case 'b', 'l':
		fmt.Fprintf(b, "CREATE FUNCTION %s.op_%d(%s) RETURNS %s LANGUAGE sql STABLE AS $t$ %s $t$;\n",
			Schema, trapSeq, args, ret, body(ret))
		if s.kind == 'b' {
			fmt.Fprintf(b, "CREATE OPERATOR %s.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = %s.op_%d);\n",
				Schema, s.name, argNames[0], argNames[1], Schema, trapSeq)
		} else {
			fmt.Fprintf(b, "CREATE OPERATOR %s.%s (RIGHTARG = %s, FUNCTION = %s.op_%d);\n",
				Schema, s.name, argNames[0], Schema, trapSeq)
		}
	}
}

func kindWord(k byte) string {
	switch k {
	case 'a':
		return "aggregate"
	case 'b', 'l':
		return "operator"
	}
	return "function"
}

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
		if s.variadic != 0 && len(s.args) > 0 {
			// proargtypes holds the variadic parameter's array type ("any" stays "any").
			s.variadic = s.args[len(s.args)-1]
		}
		return s, err
	})
}

// A Finding is a statement that met a trap.
type Finding struct {
	Where string // where the statement comes from (a file and line, a function's name)
	How   string // "plan" (its generic plan calls the sentinel), "run" (running it raised SQLState), "prepare" (it prepares without the traps and not with them)
	What  string // the plan's line, or the error
}

func (f Finding) String() string { return fmt.Sprintf("%s: %s: %s", f.Where, f.How, f.What) }

// Check prepares sql on conn, whose search_path puts Schema first, EXPLAINs its generic plan
// (VERBOSE, so every expression of every node is shown) and runs it with every parameter NULL in
// a transaction that it rolls back. It returns a Finding when the plan names the sentinel, when
// the run raised SQLState, or when the statement prepares on plain (a connection without the
// trap schema on its path) but not on conn; and ok false when the statement does not prepare
// on plain either (it cannot be checked this way: a template, a statement for another role).
func Check(ctx context.Context, conn, plain *pgx.Conn, where, sql string) (f *Finding, ok bool, err error) {
	if _, perr := plain.Prepare(ctx, "", sql); perr != nil {
		return nil, false, nil
	}
	sd, perr := conn.Prepare(ctx, "fencelock_trap_check", sql)
	if perr != nil {
		return &Finding{Where: where, How: "prepare", What: perr.Error()}, true, nil
	}
	defer func() { _ = conn.Deallocate(context.WithoutCancel(ctx), "fencelock_trap_check") }()
	nulls := strings.TrimSuffix(strings.Repeat("NULL, ", len(sd.ParamOIDs)), ", ")
	explain := "EXPLAIN (VERBOSE, COSTS OFF) EXECUTE fencelock_trap_check"
	if nulls != "" {
		explain += "(" + nulls + ")"
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, true, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
		return nil, true, err
	}
	rows, err := tx.Query(ctx, explain, pgx.QueryExecModeSimpleProtocol)
	var lines []string
	if err == nil {
		lines, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if IsTrap(err) { // the planner ran it (a constant folded)
		return &Finding{Where: where, How: "plan", What: err.Error()}, true, nil
	}
	if err != nil {
		return nil, true, fmt.Errorf("%s: explain: %w", where, err)
	}
	for _, l := range lines {
		if strings.Contains(l, Sentinel) {
			return &Finding{Where: where, How: "plan", What: strings.TrimSpace(l)}, true, nil
		}
	}
	if _, err := tx.Exec(ctx, `SET LOCAL statement_timeout = '2s'; SET LOCAL lock_timeout = '1s'; SET LOCAL plan_cache_mode = auto`); err != nil {
		return nil, true, err
	}
	args := make([]any, len(sd.ParamOIDs))
	_, rerr := tx.Exec(ctx, "fencelock_trap_check", args...)
	if IsTrap(rerr) {
		return &Finding{Where: where, How: "run", What: rerr.Error()}, true, nil
	}
	return nil, true, nil
}

// IsTrap reports whether err is, or wraps, the error a trap raises.
func IsTrap(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == SQLState
}
