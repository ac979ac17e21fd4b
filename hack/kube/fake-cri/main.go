// Command fake-cri serves Kubernetes' fake CRI runtime (k8s.io/cri-client/pkg/fake, the one
// kubelet's own tests and kubemark's hollow nodes use) on a unix socket until SIGINT or
// SIGTERM. A kubelet using it keeps its device manager, admission, checkpoint, volumes and
// pod status real; only the containers are not.
//
//	fake-cri unix:///path/runtime.sock [RECORD_DIR]
//
// With RECORD_DIR, every container the kubelet creates is written there as
// <container id>.json: the CRI ContainerConfig the kubelet sent (environment, mounts,
// devices, CDI devices, annotations, as protojson) beside its pod's namespace and name, and
// removed when the kubelet removes the container. That is how tests see that a device
// plugin's Allocate answer reached the container.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

func main() {
	if len(os.Args) < 2 || len(os.Args) > 3 {
		fmt.Fprintln(os.Stderr, "usage: fake-cri unix:///path/runtime.sock [RECORD_DIR]")
		os.Exit(2)
	}
	runtime := fakeremote.NewFakeRemoteRuntime()
	// An image of size 0 is one kubelet refuses to inspect ("Id or size of image ... is not
	// set"): every pulled image gets a size, so tagged images and IfNotPresent work.
	runtime.ImageService.SetFakeImageSize(100 << 20)
	runtime.RuntimeService.FakeStatus = &kubeapi.RuntimeStatus{Conditions: []*kubeapi.RuntimeCondition{
		{Type: kubeapi.RuntimeReady, Status: true},
		{Type: kubeapi.NetworkReady, Status: true},
	}}
	var options []grpc.ServerOption
	if len(os.Args) == 3 {
		options = append(options, grpc.UnaryInterceptor(recorder(os.Args[2])))
	}
	server := grpc.NewServer(options...)
	kubeapi.RegisterRuntimeServiceServer(server, runtime)
	kubeapi.RegisterImageServiceServer(server, runtime)
	listener, err := util.CreateListener(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go func() {
		if err := server.Serve(listener); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
	server.Stop()
}

// recorder writes each created container's config into dir and removes it with the container.
func recorder(dir string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, request any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		response, err := handler(ctx, request)
		if err != nil {
			return response, err
		}
		switch r := request.(type) {
		case *kubeapi.CreateContainerRequest:
			id := response.(*kubeapi.CreateContainerResponse).ContainerId
			if err := record(dir, id, r); err != nil {
				fmt.Fprintf(os.Stderr, "fake-cri: recording %s: %v\n", id, err)
			}
		case *kubeapi.RemoveContainerRequest:
			os.Remove(filepath.Join(dir, filepath.Base(r.ContainerId)+".json"))
		}
		return response, err
	}
}

func record(dir, id string, request *kubeapi.CreateContainerRequest) error {
	config, err := protojson.Marshal(request.Config)
	if err != nil {
		return err
	}
	metadata := request.SandboxConfig.GetMetadata()
	text, err := json.Marshal(map[string]any{"namespace": metadata.GetNamespace(), "pod": metadata.GetName(),
		"podUid": metadata.GetUid(), "config": json.RawMessage(config)})
	if err != nil {
		return err
	}
	path := filepath.Join(dir, filepath.Base(id)+".json")
	if err := os.WriteFile(path+".tmp", text, 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}
