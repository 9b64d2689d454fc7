package sparsify

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

var updateMethodsDoc = flag.Bool("update-methods-doc", false, "rewrite the generated list of methods in doc.go")

// methodsDoc is the package documentation's list of methods, from the
// declarations: method (the file of its constructor): Doc.
func methodsDoc() string {
	var b strings.Builder
	for _, m := range Methods() {
		if strings.HasPrefix(m.Name, "zz-") {
			continue // registered by a test
		}
		file, _ := runtime.FuncForPC(reflect.ValueOf(m.New).Pointer()).FileLine(reflect.ValueOf(m.New).Pointer())
		b.WriteString(wrapComment("//   - ", "//     ", fmt.Sprintf("%q (%s): %s", m.Name, filepath.Base(file), m.Doc), 78))
	}
	return b.String()
}

// TestMethodsDoc: the package documentation lists every method as its
// declaration says (go generate ./sparsify rewrites the list), and every
// method says what it is.
func TestMethodsDoc(t *testing.T) {
	for _, m := range Methods() {
		if m.Doc == "" && !strings.HasPrefix(m.Name, "zz-") {
			t.Errorf("%s declares no Doc", m.Name)
		}
	}
	const marker = "// file): Method.Doc.\n//\n"
	const end = "//\n// Every method except gtopk"
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, marker), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("doc.go lacks the line %q before the list and %q after it", marker, end)
	}
	want := doc[:i+len(marker)] + methodsDoc() + doc[j:]
	if want == doc {
		return
	}
	if *updateMethodsDoc {
		if err := os.WriteFile("doc.go", []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("doc.go's list of methods is out of date; run go generate ./sparsify. Want:\n%s", methodsDoc())
}
