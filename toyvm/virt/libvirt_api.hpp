#pragma once
// libvirt's C API, loaded with dlopen the first time a backend is opened. Only
// `toyvm compute` talks to libvirt; the short-lived commands (schedule, show, destroy) would
// otherwise spend most of their start-up resolving symbols of libvirt and the ~60 libraries
// it pulls in (glib, gnutls, libxml2, curl, ...).

#include "core/error.hpp"

#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>

#include <string>

namespace toyvm {

#define TOYVM_LIBVIRT_FUNCTIONS(X) \
  X(virInitialize)                 \
  X(virSetErrorFunc)               \
  X(virGetLastError)               \
  X(virConnectOpen)                \
  X(virConnectClose)               \
  X(virConnectIsAlive)             \
  X(virConnectListAllDomains)      \
  X(virDomainLookupByUUIDString)   \
  X(virDomainDefineXML)            \
  X(virDomainIsActive)             \
  X(virDomainGetState)             \
  X(virDomainGetInfo)              \
  X(virDomainMemoryStats)          \
  X(virDomainGetBlockInfo)         \
  X(virEventRegisterDefaultImpl)   \
  X(virEventRunDefaultImpl)        \
  X(virConnectDomainEventRegisterAny)   \
  X(virConnectDomainEventDeregisterAny) \
  X(virDomainCreate)               \
  X(virDomainResume)               \
  X(virDomainDestroy)              \
  X(virDomainUndefine)             \
  X(virDomainFree)                 \
  X(virDomainGetName)              \
  X(virDomainGetUUIDString)        \
  X(virDomainGetMetadata)          \
  X(virDomainShutdown)             \
  X(virDomainMigrateToURI3)        \
  X(virDomainGetJobStats)          \
  X(virDomainGetJobInfo)           \
  X(virDomainAbortJob)             \
  X(virTypedParamsGetULLong)       \
  X(virTypedParamsFree)            \
  X(virDomainInterfaceAddresses)   \
  X(virDomainInterfaceFree)        \
  X(virNetworkLookupByName)        \
  X(virNetworkIsActive)            \
  X(virNetworkCreate)              \
  X(virNetworkGetXMLDesc)          \
  X(virNetworkFree)                \
  X(virStoragePoolLookupByName)    \
  X(virStoragePoolCreateXML)       \
  X(virStoragePoolRefresh)         \
  X(virStoragePoolDestroy)         \
  X(virStoragePoolFree)            \
  X(virStorageVolLookupByName)     \
  X(virStorageVolCreateXML)        \
  X(virStorageVolDelete)           \
  X(virStorageVolGetPath)          \
  X(virStorageVolFree)             \
  X(virStorageVolLookupByPath)     \
  X(virStorageVolDownload)         \
  X(virStorageVolUpload)           \
  X(virStorageVolResize)           \
  X(virStorageVolGetInfo)          \
  X(virStreamNew)                  \
  X(virStreamRecv)                 \
  X(virStreamSend)                 \
  X(virStreamFinish)               \
  X(virStreamAbort)                \
  X(virStreamFree)

struct LibvirtApi {
#define TOYVM_LIBVIRT_POINTER(name) decltype(&::name) name = nullptr;
  TOYVM_LIBVIRT_FUNCTIONS(TOYVM_LIBVIRT_POINTER)
#undef TOYVM_LIBVIRT_POINTER
};

// Loads libvirt once per process; virt_unavailable, saying why, when it cannot.
result<const LibvirtApi*> load_libvirt();

}  // namespace toyvm
