#!/bin/sh
# Issues the certificates for mutual TLS between kube-scheduler and gpulet's extender, without
# cert-manager (docs/memory-requests.md, "Mutual TLS"). Two CAs, so that neither side's key can
# stand in for the other:
#   server CA  signs the extender's serving certificate (gpulet-extender.<ns>.svc); the scheduler
#              trusts it (tlsConfig.caFile);
#   client CA  signs kube-scheduler's client certificate; the extender accepts only certificates
#              it signed (web-config client_ca_file, RequireAndVerifyClientCert).
# Output, one directory per Secret, named by the Secret's keys:
#   DIR/extender/{tls.crt,tls.key,ca.crt}   Secret gpulet-extender-tls (ca.crt = the client CA)
#   DIR/scheduler/{tls.crt,tls.key,ca.crt}  Secret gpulet-extender-client, mounted into
#                                           kube-scheduler at /etc/gpulet-extender-client
#                                           (ca.crt = the server CA)
# The CA keys stay in DIR (keep them offline, or delete them: re-run to rotate).
# Usage: make-certs.sh DIR [NAMESPACE] [--apply]   (--apply: create both Secrets with kubectl)
set -eu
if [ $# -lt 1 ]; then
  echo "usage: $0 DIR [NAMESPACE] [--apply]" >&2
  exit 2
fi
dir=$1
ns=gpulet-system
apply=no
shift
for a in "$@"; do
  case $a in
    --apply) apply=yes ;;
    *) ns=$a ;;
  esac
done
days=${GPULET_CERT_DAYS:-365}
openssl=${OPENSSL:-openssl}
umask 077
mkdir -p "$dir/ca" "$dir/extender" "$dir/scheduler"

ca() {  # name, subject
  "$openssl" req -x509 -newkey rsa:2048 -nodes -sha256 -days "$days" \
    -keyout "$dir/ca/$1.key" -out "$dir/ca/$1.crt" -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}
leaf() {  # ca name, out dir, subject, extensions file
  "$openssl" req -newkey rsa:2048 -nodes -sha256 -keyout "$2/tls.key" -out "$2/tls.csr" \
    -subj "/CN=$3" 2>/dev/null
  "$openssl" x509 -req -sha256 -days "$days" -in "$2/tls.csr" -CA "$dir/ca/$1.crt" \
    -CAkey "$dir/ca/$1.key" -CAcreateserial -out "$2/tls.crt" -extfile "$4" 2>/dev/null
  rm -f "$2/tls.csr"
}

ca server-ca gpulet-extender-server-ca
ca client-ca gpulet-extender-client-ca

svc=gpulet-extender
cat > "$dir/ca/server.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:$svc,DNS:$svc.$ns,DNS:$svc.$ns.svc,DNS:$svc.$ns.svc.cluster.local
EXT
cat > "$dir/ca/client.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
EXT
leaf server-ca "$dir/extender" "$svc.$ns.svc" "$dir/ca/server.ext"
leaf client-ca "$dir/scheduler" gpulet-memory-scheduler "$dir/ca/client.ext"
cp "$dir/ca/client-ca.crt" "$dir/extender/ca.crt"
cp "$dir/ca/server-ca.crt" "$dir/scheduler/ca.crt"

if [ "$apply" = yes ]; then
  for pair in "gpulet-extender-tls extender" "gpulet-extender-client scheduler"; do
    set -- $pair
    kubectl -n "$ns" create secret generic "$1" --from-file="$dir/$2/tls.crt" \
      --from-file="$dir/$2/tls.key" --from-file="$dir/$2/ca.crt" \
      --dry-run=client -o yaml | kubectl apply -f -
  done
else
  echo "certificates in $dir; create the Secrets with:"
  echo "  kubectl -n $ns create secret generic gpulet-extender-tls --from-file=$dir/extender/tls.crt --from-file=$dir/extender/tls.key --from-file=$dir/extender/ca.crt"
  echo "  kubectl -n $ns create secret generic gpulet-extender-client --from-file=$dir/scheduler/tls.crt --from-file=$dir/scheduler/tls.key --from-file=$dir/scheduler/ca.crt"
fi
