package testenv

import (
	"go/ast"
	"reflect"
	"strconv"
	"strings"
)

// EnvTag reads a struct field's go-envconfig tag, for tests that check
// docs and deploy files against the variables relayd reads: the variable,
// its options, and its default (go-envconfig takes all after "default=").
func EnvTag(f *ast.Field) (name, opts, def string, ok bool) {
	if f.Tag == nil {
		return "", "", "", false
	}
	tag, _ := strconv.Unquote(f.Tag.Value)
	spec, ok := reflect.StructTag(tag).Lookup("env")
	if !ok {
		return "", "", "", false
	}
	name, opts, _ = strings.Cut(spec, ",")
	_, def, _ = strings.Cut(opts, "default=")
	return strings.TrimSpace(name), opts, def, true
}
