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
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
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
	g := generator{exact: map[string]bool{}, made: map[string]bool{}, byOID: map[uint32]pgType{}}
	var err error
	if g.universe, err = readUniverse(ctx, conn); err != nil {
		return "", 0, err
	}
	if g.casts, err = readImplicitCasts(ctx, conn); err != nil {
		return "", 0, err
	}
	if g.poly, err = readPolymorphic(ctx, conn); err != nil {
		return "", 0, err
	}
	if g.elemOf, g.arrayOf, err = readArrayTypes(ctx, conn); err != nil {
		return "", 0, err
	}
	if g.typeNames, g.pseudo, err = readTypeNames(ctx, conn); err != nil {
		return "", 0, err
	}
	sigs, err := readSignatures(ctx, conn, names)
	if err != nil {
		return "", 0, err
	}
	for _, s := range sigs {
		g.exact[s.key(s.args)] = true
	}
	for _, t := range g.universe {
		g.byOID[t.oid] = t
	}
	fmt.Fprintf(&g.b, "DROP SCHEMA IF EXISTS %s CASCADE;\nCREATE SCHEMA %s;\n", Schema, Schema)
	fmt.Fprintf(&g.b, `CREATE FUNCTION %[1]s.%[2]s(label text) RETURNS text LANGUAGE plpgsql STABLE AS $t$
BEGIN
    RAISE EXCEPTION 'fencelock_trap: %% ran: a statement resolved it through the search_path', label
        USING ERRCODE = '%[3]s';
END $t$;
CREATE FUNCTION %[1]s.%[2]s_void(label text) RETURNS void LANGUAGE plpgsql STABLE AS $t$
BEGIN
    PERFORM %[1]s.%[2]s(label);
END $t$;
`, Schema, Sentinel, SQLState)
	for _, s := range sigs {
		if s.variadic == 0 {
			g.emit(s, s.args)
			continue
		}
		// Called with the variadic list spread out: one and two arguments in its place.
		fixed := s.args[:len(s.args)-1]
		for extra := 1; extra <= 2; extra++ {
			spread := slices.Concat(fixed, slices.Repeat([]uint32{s.variadic}, extra))
			g.emit(s, spread)
		}
	}
	return g.b.String(), g.seq, nil
}

// generator holds what Generate read from the catalog and the traps it has written.
type generator struct {
	universe        []pgType
	byOID           map[uint32]pgType  // the universe by oid
	casts           map[[2]uint32]bool // implicit casts, source and target
	poly            map[uint32]string  // polymorphic pseudo-types by oid
	elemOf, arrayOf map[uint32]uint32  // array type to element type, and back
	typeNames       map[uint32]string  // every type's name (format_type)
	pseudo          map[uint32]bool    // pseudo-types
	exact, made     map[string]bool    // pg_catalog's signatures; the traps written
	seq             int                // traps written, which also numbers their helpers
	b               strings.Builder
}

func (s signature) key(args []uint32) string {
	k := string(s.kind)
	if s.kind == 'f' || s.kind == 'a' {
		k = "f"
	}
	return fmt.Sprintf("%s %s %v", k, s.name, args)
}

// accepts lists the universe's types that pg_catalog takes at a parameter of type p without
// an exact match: by an implicit cast, or by a polymorphic parameter (and p itself).
func (g *generator) accepts(p uint32) []uint32 {
	var out []uint32
	for _, t := range g.universe {
		switch g.poly[p] {
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
			if t.oid == p || g.casts[[2]uint32{t.oid, p}] {
				out = append(out, t.oid)
			}
		}
	}
	return out
}

// emit writes the traps of s, called with parameters params, for every combination of the
// types its parameters accept that no pg_catalog signature of its name matches exactly.
func (g *generator) emit(s signature, params []uint32) {
	if len(params) == 0 {
		return // nothing to coerce: pg_catalog's own is exact
	}
	choices := make([][]uint32, len(params))
	for i, p := range params {
		if choices[i] = g.accepts(p); len(choices[i]) == 0 {
			return
		}
	}
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
		if g.exact[k] || g.made[k] {
			return
		}
		result, ok := g.resolveResult(s.result, params, combo)
		if !ok || g.poly[result] != "" || (result != voidOID && g.pseudo[result]) {
			return // unresolved, or record, trigger, internal: no trap can stand for it
		}
		g.made[k] = true
		g.write(s, combo, result)
	}
	walk(0)
}

const voidOID = 2278

// resolveResult returns the result type of a call with argument types combo of a signature
// with parameters params and result result: result itself, or for a polymorphic result the
// type its polymorphic parameters bind.
func (g *generator) resolveResult(result uint32, params, combo []uint32) (uint32, bool) {
	kind := g.poly[result]
	if kind == "" {
		return result, true
	}
	var elem uint32
	for i, p := range params {
		switch g.poly[p] {
		case "anyelement", "anynonarray", "anycompatible", "anycompatiblenonarray":
			elem = combo[i]
		case "anyarray", "anycompatiblearray":
			elem = g.elemOf[combo[i]]
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
		a, ok := g.arrayOf[elem]
		return a, ok
	}
	return 0, false
}

// write writes one trap: a function, an aggregate (its state and final functions) or an
// operator (its function) of schema Schema, whose every path calls the sentinel.
func (g *generator) write(s signature, combo []uint32, result uint32) {
	g.seq++
	argNames := make([]string, len(combo))
	for i, a := range combo {
		argNames[i] = g.byOID[a].name
	}
	args := strings.Join(argNames, ", ")
	label := strings.ReplaceAll(fmt.Sprintf("%s %s(%s)", kindWord(s.kind), s.name, args), "'", "''")
	ret := g.typeNames[result]
	body := fmt.Sprintf("SELECT %s.%s('%s')::%s", Schema, Sentinel, label, ret)
	if result == voidOID {
		body = fmt.Sprintf("SELECT %s.%s_void('%s')", Schema, Sentinel, label)
	}
	b := &g.b
	switch s.kind {
	case 'f':
		setof := ""
		if s.retset {
			setof = "SETOF "
		}
		fmt.Fprintf(b, "CREATE FUNCTION %s.%s(%s) RETURNS %s%s LANGUAGE sql STABLE AS $t$ %s $t$;\n",
			Schema, pgx.Identifier{s.name}.Sanitize(), args, setof, ret, body)
	case 'a':
		if result == voidOID {
			return
		}
		fmt.Fprintf(b, "CREATE FUNCTION %[1]s.agg_s_%[2]d(text, %[3]s) RETURNS text LANGUAGE sql STABLE AS $t$ SELECT %[1]s.%[4]s('%[5]s') $t$;\n",
			Schema, g.seq, args, Sentinel, label)
		fmt.Fprintf(b, "CREATE FUNCTION %[1]s.agg_f_%[2]d(text) RETURNS %[3]s LANGUAGE sql STABLE AS $t$ %[4]s $t$;\n",
			Schema, g.seq, ret, body)
		fmt.Fprintf(b, "CREATE AGGREGATE %[1]s.%[2]s(%[3]s) (SFUNC = %[1]s.agg_s_%[4]d, STYPE = text, FINALFUNC = %[1]s.agg_f_%[4]d);\n",
			Schema, pgx.Identifier{s.name}.Sanitize(), args, g.seq)
	case 'b', 'l':
		fmt.Fprintf(b, "CREATE FUNCTION %s.op_%d(%s) RETURNS %s LANGUAGE sql STABLE AS $t$ %s $t$;\n",
			Schema, g.seq, args, ret, body)
		if s.kind == 'b' {
			fmt.Fprintf(b, "CREATE OPERATOR %s.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = %s.op_%d);\n",
				Schema, s.name, argNames[0], argNames[1], Schema, g.seq)
		} else {
			fmt.Fprintf(b, "CREATE OPERATOR %s.%s (RIGHTARG = %s, FUNCTION = %s.op_%d);\n",
				Schema, s.name, argNames[0], Schema, g.seq)
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
