package sqltrap

import (
	"regexp"
	"sort"
	"strings"
)

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
