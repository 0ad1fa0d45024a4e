// kubecheck reads Kubernetes manifests (YAML documents, as `helm template` prints them) on stdin
// and decodes each strictly into the Kubernetes API's own Go types (and the Prometheus
// operator's, for a ServiceMonitor): an unknown or misplaced field, a wrong type, an unknown kind
// or apiVersion is an error. One line a document; exit 1 if any is invalid.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

func main() {
	types := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{scheme.AddToScheme, monitoringv1.AddToScheme} {
		if err := add(types); err != nil {
			fmt.Fprintln(os.Stderr, "kubecheck:", err)
			os.Exit(2)
		}
	}
	decode := serializer.NewCodecFactory(types, serializer.EnableStrict).UniversalDeserializer()
	docs := utilyaml.NewYAMLReader(bufio.NewReader(os.Stdin))
	checked, invalid := 0, 0
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			fmt.Println("invalid: not YAML:", err)
			os.Exit(1)
		}
		if empty(doc) {
			continue
		}
		object, kind, err := decode.Decode(doc, nil, nil)
		if err != nil {
			fmt.Println("invalid:", strings.ReplaceAll(err.Error(), "\n", " "))
			invalid++
			continue
		}
		name := ""
		if accessor, err := meta.Accessor(object); err == nil {
			name = accessor.GetName()
		}
		fmt.Printf("ok %s/%s %s\n", kind.GroupVersion(), kind.Kind, name)
		checked++
	}
	if invalid > 0 || checked == 0 {
		os.Exit(1)
	}
}

// empty says whether a document holds nothing but comments and blank lines.
func empty(doc []byte) bool {
	for _, line := range bytes.Split(doc, []byte("\n")) {
		trimmed := bytes.TrimSpace(line)
		if len(trimmed) > 0 && trimmed[0] != '#' && string(trimmed) != "---" {
			return false
		}
	}
	return true
}
