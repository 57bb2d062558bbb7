// Command null_extender is a lab-only scheduler extender that decides nothing: its filter keeps every node
// kube-scheduler offers and its bind POSTs the Binding as asked. bench/e2e_throughput.py --null runs it beside
// the real extender to measure what the extender protocol itself (a filter and a bind round trip per pod, and a
// Binding posted under the extender's own identity) costs on this host, apart from anything kube-qos-extender
// decides. It is a measuring stick, never shipped: the product is the Python extender.
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"time"
)

// kube-scheduler's extender types carry no JSON tags, so the keys are the Go field names (EXTENDER-PROTOCOL.md).
// filterArgs reads only what the answer needs; with nodeCacheCapable kube-scheduler sends node names.
type filterArgs struct {
	NodeNames *[]string `json:"NodeNames"`
}

type filterResult struct {
	NodeNames                  *[]string         `json:"NodeNames"`
	FailedNodes                map[string]string `json:"FailedNodes"`
	FailedAndUnresolvableNodes map[string]string `json:"FailedAndUnresolvableNodes"`
	Error                      string            `json:"Error"`
}

type bindArgs struct {
	PodName      string `json:"PodName"`
	PodNamespace string `json:"PodNamespace"`
	PodUID       string `json:"PodUID"`
	Node         string `json:"Node"`
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "where kube-scheduler calls the verbs (plain HTTP, loopback)")
	server := flag.String("server", "", "the API server's URL")
	ca := flag.String("ca", "", "the API server's CA bundle")
	cert := flag.String("cert", "", "client certificate for the Binding POSTs")
	key := flag.String("key", "", "its key")
	conns := flag.Int("max-conns", 64, "Binding POSTs in flight at most (as the real extender's bind.max_in_flight)")
	flag.Parse()

	pair, err := tls.LoadX509KeyPair(*cert, *key)
	if err != nil {
		log.Fatalf("client certificate: %v", err)
	}
	pem, err := os.ReadFile(*ca)
	if err != nil {
		log.Fatalf("CA: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		log.Fatalf("CA %s: no certificate", *ca)
	}
	api := &http.Client{
		Timeout: 40 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}},
			MaxConnsPerHost:     *conns,
			MaxIdleConnsPerHost: *conns,
			ForceAttemptHTTP2:   false,
		},
	}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /filter", func(w http.ResponseWriter, r *http.Request) {
		var args filterArgs
		if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		answer(w, filterResult{NodeNames: args.NodeNames, FailedNodes: map[string]string{},
			FailedAndUnresolvableNodes: map[string]string{}})
	})
	mux.HandleFunc("POST /bind", func(w http.ResponseWriter, r *http.Request) {
		var args bindArgs
		if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		answer(w, map[string]string{"Error": bind(api, *server, args)})
	})
	log.Printf("null extender on %s", *listen)
	log.Fatal(http.ListenAndServe(*listen, mux))
}

func bind(api *http.Client, server string, a bindArgs) string {
	body, _ := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Binding",
		"metadata": map[string]string{"name": a.PodName, "uid": a.PodUID},
		"target":   map[string]string{"kind": "Node", "name": a.Node},
	})
	url := fmt.Sprintf("%s/api/v1/namespaces/%s/pods/%s/binding", server, a.PodNamespace, a.PodName)
	resp, err := api.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("binding %s/%s: %d %s", a.PodNamespace, a.PodName, resp.StatusCode, msg)
	}
	return ""
}

func answer(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
