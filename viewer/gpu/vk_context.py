"""The Vulkan context: instance (+ validation), physical device, logical device, graphics queue, memory helpers.

One object, :class:`VulkanContext`, owns the instance and the device. Everything created from it (frame ring,
passes, targets) registers a ``close`` callback with :meth:`VulkanContext.own`, and :meth:`VulkanContext.close`
closes them newest first before it destroys the device, the debug messenger and the instance, so a context can
be opened and closed any number of times in one process without leaking (the validation layer reports any
object left alive at ``vkDestroyDevice`` as an error, and the tests count those).

Device choice (DESIGN §6): when a CUDA device UUID is given, the Vulkan physical device whose
``VkPhysicalDeviceIDProperties.deviceUUID`` equals it; otherwise ``RIGEL_VK_DEVICE`` (a substring of the device
name) or the first discrete, integrated, virtual, then CPU device (lavapipe) that meets the requirements.

Errors: anything missing (loader, driver, extension, feature, layer) raises :class:`VulkanUnavailable` with one
message that names what is missing and what to install. Pitfalls of the ``vulkan`` binding that shape this code
are listed in ../shared/docs/PLATFORM.md (nested structs kept alive in variables; ``vkMapMemory`` with an
explicit size; extension functions through ``vkGet*ProcAddr``).
"""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field

__all__ = ["VulkanUnavailable", "VulkanContext", "Buffer", "Image", "load_vulkan", "validation_log", "check_result",
           "ValidationLog", "INSTALL_HINT"]

INSTALL_HINT = ("install a Vulkan driver, e.g. `apt-get install libvulkan1 mesa-vulkan-drivers` (lavapipe, runs on "
                "the CPU) or your GPU vendor's driver")
VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"
UINT64_MAX = 0xFFFFFFFFFFFFFFFF


class VulkanUnavailable(RuntimeError):
    """Vulkan cannot be used here; the message says what is missing and how to install it."""


_vk = None


def load_vulkan():
    """The ``vulkan`` module (cffi binding). Raises VulkanUnavailable when the package or libvulkan is missing."""
    global _vk
    if _vk is not None:
        return _vk
    try:
        import vulkan  # noqa: F401  (dlopens libvulkan.so.1 at import)
    except ImportError as e:
        raise VulkanUnavailable(f"the Python package `vulkan` is not installed ({e}): `pip install vulkan` "
                                "(rigel's 'viewer' extra)") from None
    except OSError as e:
        raise VulkanUnavailable(f"the Vulkan loader libvulkan.so.1 is missing ({e}): `apt-get install libvulkan1 "
                                "mesa-vulkan-drivers`") from None
    import vulkan as vk

    _vk = vk
    return vk


# ---- validation messages -----------------------------------------------------------------------------------
class ValidationLog:
    """Counts validation-layer messages of every context of the process (the binding routes all debug
    messengers through one Python callback). ``errors`` is what the tests require to stay 0."""

    def __init__(self):
        self.lock = threading.Lock()
        self.errors = 0
        self.warnings = 0
        self.messages: list[str] = []
        self.echo = True

    def record(self, severity: int, text: str):
        vk = load_vulkan()
        with self.lock:
            if severity & vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT:
                self.errors += 1
                kind = "ERROR"
            elif severity & vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT:
                self.warnings += 1
                kind = "WARNING"
            else:
                return
            self.messages.append(f"[vulkan {kind}] {text}")
            del self.messages[:-200]
        if self.echo:
            print(f"[vulkan {kind}] {text}", file=sys.stderr)


validation_log = ValidationLog()


def _debug_callback(severity, types, callback_data, user_data):
    try:
        msg = callback_data.pMessage
        if not isinstance(msg, str):
            msg = load_vulkan().ffi.string(msg).decode("utf-8", "replace")
        validation_log.record(int(severity), msg)
    except Exception as e:  # never raise into the driver
        print(f"[vulkan] debug callback failed: {e}", file=sys.stderr)
    return 0


# ---- resources ---------------------------------------------------------------------------------------------
@dataclass
class Buffer:
    """A VkBuffer with its own VkDeviceMemory. ``mapped`` is a writable cffi buffer of ``size`` bytes when the
    memory is host-visible, else None. ``alloc_size`` is the allocation size (what CUDA must import)."""

    ctx: "VulkanContext"
    handle: object
    memory: object
    size: int
    alloc_size: int
    mapped: object = None
    exportable: bool = False
    dedicated: bool = False

    def destroy(self):
        vk = self.ctx.vk
        if self.handle is None:
            return
        if self.mapped is not None:
            vk.vkUnmapMemory(self.ctx.device, self.memory)
            self.mapped = None
        vk.vkDestroyBuffer(self.ctx.device, self.handle, None)
        vk.vkFreeMemory(self.ctx.device, self.memory, None)
        self.handle = self.memory = None


@dataclass
class Image:
    """A 2D colour VkImage with memory and a view."""

    ctx: "VulkanContext"
    handle: object
    memory: object
    view: object
    width: int
    height: int
    format: int

    def destroy(self):
        vk = self.ctx.vk
        if self.handle is None:
            return
        vk.vkDestroyImageView(self.ctx.device, self.view, None)
        vk.vkDestroyImage(self.ctx.device, self.handle, None)
        vk.vkFreeMemory(self.ctx.device, self.memory, None)
        self.handle = self.memory = self.view = None


@dataclass
class DeviceInfo:
    physical_device: object
    name: str
    device_type: int
    api_version: int
    uuid: bytes
    extensions: set = field(default_factory=set)


def _uuid_bytes(u) -> bytes:
    """Normalise a UUID given as bytes, a cffi uint8_t[16], a uuid.UUID or a string ("GPU-…" allowed)."""
    import uuid as _uuid

    if u is None:
        return b""
    if isinstance(u, (bytes, bytearray)):
        return bytes(u)
    if isinstance(u, _uuid.UUID):
        return u.bytes
    if isinstance(u, str):
        s = u[4:] if u.upper().startswith("GPU-") else u
        return _uuid.UUID(s).bytes
    return bytes(bytearray(int(x) & 0xFF for x in u))


def cuda_device_uuid(index: int = 0) -> bytes | None:
    """The UUID of CUDA device ``index`` as 16 bytes, or None without CUDA (torch.cuda.get_device_properties)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        return _uuid_bytes(str(torch.cuda.get_device_properties(index).uuid))
    except Exception:
        return None


def check_result(vk, result: int, what: str = "Vulkan call"):
    """Raise the binding's exception for a non-success ``VkResult`` returned by a raw ``vk.lib`` call (the same
    exception classes the binding's wrappers raise, e.g. ``vk.VkErrorDeviceLost``)."""
    if result != vk.VK_SUCCESS:
        exc = vk.exception_codes.get(result)
        if exc is None:
            raise RuntimeError(f"{what} returned VkResult {result}")
        raise exc(f"{what} returned VkResult {result}")


class VulkanContext:
    """Instance, debug messenger, physical and logical device, one graphics queue and a command pool.

    Two phases, because a window surface needs the instance before a device can be checked for presenting to
    it: ``ctx = VulkanContext(...)`` creates the instance; :meth:`init_device` picks and creates the device.

    Args:
        validation: enable ``VK_LAYER_KHRONOS_validation`` with a debug messenger counting into
            :data:`validation_log`. Raises VulkanUnavailable when the layer is not installed.
        instance_extensions: extra instance extensions (e.g. GLFW's ``VK_KHR_surface`` + ``VK_KHR_xcb_surface``).
        app_name: shown to drivers and tools.

    Raises:
        VulkanUnavailable: no loader, no driver (``VK_ERROR_INCOMPATIBLE_DRIVER``), a missing layer or extension.
    """

    def __init__(self, *, validation: bool = False, instance_extensions=(), app_name: str = "rigel-viewer"):
        self.vk = vk = load_vulkan()
        self.validation = bool(validation)
        self.instance = None
        self.messenger = None
        self.device = None
        self.physical_device = None
        self.queue = None
        self.queue_family = None
        self.command_pool = None
        self.info: DeviceInfo | None = None
        self.interop = False
        self._owned: list = []
        self._fns: dict = {}
        self._closed = False
        self._c_counter = vk.ffi.new("uint64_t*")   # timeline_value's output cell (polled per frame)

        layers = []
        exts = list(dict.fromkeys(instance_extensions))
        try:
            available_exts = {e.extensionName for e in vk.vkEnumerateInstanceExtensionProperties(None)}
        except vk.VkError as e:
            raise VulkanUnavailable(f"the Vulkan loader cannot list instance extensions ({type(e).__name__}): "
                                    f"{INSTALL_HINT}") from None
        if self.validation:
            have_layers = {l.layerName for l in vk.vkEnumerateInstanceLayerProperties()}
            if VALIDATION_LAYER not in have_layers:
                raise VulkanUnavailable(f"the validation layer {VALIDATION_LAYER} is not installed: "
                                        "`apt-get install vulkan-validationlayers` (or run without --debug)")
            layers.append(VALIDATION_LAYER)
            exts.append("VK_EXT_debug_utils")
        exts = list(dict.fromkeys(exts))
        missing = [e for e in exts if e not in available_exts]
        if missing:
            hint = INSTALL_HINT
            if any("surface" in e for e in missing):
                hint = ("a window-system surface extension is missing; use --offscreen, or " + INSTALL_HINT)
            raise VulkanUnavailable(f"the Vulkan instance lacks extension(s) {', '.join(missing)}: {hint}")

        app_info = vk.VkApplicationInfo(pApplicationName=app_name, applicationVersion=1, pEngineName="rigel",
                                        engineVersion=1, apiVersion=vk.VK_MAKE_VERSION(1, 2, 0))
        self._messenger_info = None
        if self.validation:
            self._messenger_info = vk.VkDebugUtilsMessengerCreateInfoEXT(
                messageSeverity=(vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT
                                 | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT),
                messageType=(vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT
                             | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT
                             | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT),
                pfnUserCallback=_debug_callback)
        create_info = vk.VkInstanceCreateInfo(
            pNext=self._messenger_info, pApplicationInfo=app_info,
            enabledLayerCount=len(layers), ppEnabledLayerNames=layers or None,
            enabledExtensionCount=len(exts), ppEnabledExtensionNames=exts or None)
        try:
            self.instance = vk.vkCreateInstance(create_info, None)
        except vk.VkErrorIncompatibleDriver:
            raise VulkanUnavailable(f"no Vulkan driver (ICD) was found: {INSTALL_HINT}") from None
        except vk.VkErrorLayerNotPresent:
            raise VulkanUnavailable(f"the layer {VALIDATION_LAYER} failed to load: "
                                    "`apt-get install vulkan-validationlayers`") from None
        except vk.VkErrorExtensionNotPresent:
            raise VulkanUnavailable(f"the Vulkan instance lacks one of {exts}: {INSTALL_HINT}") from None
        except vk.VkError as e:
            raise VulkanUnavailable(f"vkCreateInstance failed ({type(e).__name__}): {INSTALL_HINT}") from None
        if self.validation:
            create = self.instance_fn("vkCreateDebugUtilsMessengerEXT")
            self.messenger = create(self.instance, self._messenger_info, None)

    # ---- extension functions ---------------------------------------------------------------------------
    def instance_fn(self, name: str):
        """An instance-level extension function (``vkGetInstanceProcAddr``), cached."""
        if name not in self._fns:
            self._fns[name] = self.vk.vkGetInstanceProcAddr(self.instance, name)
        return self._fns[name]

    def device_fn(self, name: str):
        """A device-level extension function (``vkGetDeviceProcAddr``), cached."""
        if name not in self._fns:
            self._fns[name] = self.vk.vkGetDeviceProcAddr(self.device, name)
        return self._fns[name]

    # ---- device selection ------------------------------------------------------------------------------
    def _device_infos(self) -> list[DeviceInfo]:
        vk = self.vk
        try:
            pds = vk.vkEnumeratePhysicalDevices(self.instance)
        except vk.VkError:
            pds = []
        infos = []
        for pd in pds:
            id_props = vk.VkPhysicalDeviceIDProperties()
            props2 = vk.VkPhysicalDeviceProperties2(pNext=id_props)
            vk.vkGetPhysicalDeviceProperties2(pd, props2)
            p = props2.properties
            name = vk.ffi.string(p.deviceName).decode("utf-8", "replace")
            uuid = bytes(bytearray(id_props.deviceUUID[i] for i in range(16)))
            exts = {e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(pd, None)}
            infos.append(DeviceInfo(pd, name, int(p.deviceType), int(p.apiVersion), uuid, exts))
        return infos

    def _timeline_supported(self, pd) -> bool:
        vk = self.vk
        f12 = vk.VkPhysicalDeviceVulkan12Features()
        f2 = vk.VkPhysicalDeviceFeatures2(pNext=f12)
        vk.vkGetPhysicalDeviceFeatures2(pd, f2)
        return bool(f12.timelineSemaphore)

    def _graphics_family(self, pd, surface) -> int | None:
        vk = self.vk
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(pd)
        for i, fam in enumerate(families):
            if not fam.queueFlags & vk.VK_QUEUE_GRAPHICS_BIT:
                continue
            if surface is not None:
                support = self.instance_fn("vkGetPhysicalDeviceSurfaceSupportKHR")
                if not support(pd, i, surface):
                    continue
            return i
        return None

    def init_device(self, *, surface=None, interop: bool = False, device_uuid=None) -> "VulkanContext":
        """Pick the physical device and create the logical device, queue and command pool.

        Args:
            surface: a VkSurfaceKHR the queue must present to (then ``VK_KHR_swapchain`` is required), or None.
            interop: require ``VK_KHR_external_memory_fd`` + ``VK_KHR_external_semaphore_fd`` (the CUDA path).
            device_uuid: the CUDA device's UUID (bytes / str / torch's ``uuid``); the Vulkan device with this
                ``deviceUUID`` is taken. Required to exist when ``interop`` is set.
        Raises:
            VulkanUnavailable: no device meets the requirements (each candidate's reason is in the message).
        """
        vk = self.vk
        want_uuid = _uuid_bytes(device_uuid)
        need_exts = []
        if surface is not None:
            need_exts.append("VK_KHR_swapchain")
        if interop:
            need_exts += ["VK_KHR_external_memory_fd", "VK_KHR_external_semaphore_fd"]
        infos = self._device_infos()
        if not infos:
            raise VulkanUnavailable(f"Vulkan found no physical device: {INSTALL_HINT}")
        order = {vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: 0, vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: 1,
                 vk.VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: 2, vk.VK_PHYSICAL_DEVICE_TYPE_CPU: 3}
        infos.sort(key=lambda d: order.get(d.device_type, 4))
        wanted_name = os.environ.get("RIGEL_VK_DEVICE", "").lower()
        if want_uuid:
            matching = [d for d in infos if d.uuid == want_uuid]
            if not matching and interop:
                raise VulkanUnavailable(
                    "no Vulkan device has the CUDA device's UUID (Vulkan devices: "
                    + ", ".join(f"{d.name} {d.uuid.hex()}" for d in infos)
                    + "): install the NVIDIA Vulkan driver (the ICD of libnvidia-gl) matching the CUDA driver")
            infos = matching + [d for d in infos if d.uuid != want_uuid]
        elif wanted_name:
            infos = [d for d in infos if wanted_name in d.name.lower()] + \
                    [d for d in infos if wanted_name not in d.name.lower()]
        reasons = []
        for d in infos:
            missing = [e for e in need_exts if e not in d.extensions]
            if d.api_version < vk.VK_MAKE_VERSION(1, 2, 0):
                reasons.append(f"{d.name}: Vulkan {vk.VK_VERSION_MAJOR(d.api_version)}."
                               f"{vk.VK_VERSION_MINOR(d.api_version)} < 1.2")
                continue
            if missing:
                reasons.append(f"{d.name}: lacks {', '.join(missing)}")
                continue
            if not self._timeline_supported(d.physical_device):
                reasons.append(f"{d.name}: no timeline semaphores")
                continue
            fam = self._graphics_family(d.physical_device, surface)
            if fam is None:
                reasons.append(f"{d.name}: no graphics queue" + (" that can present to the window" if surface else ""))
                continue
            if want_uuid and interop and d.uuid != want_uuid:
                reasons.append(f"{d.name}: not the CUDA device")
                continue
            self._create_device(d, fam, need_exts)
            self.interop = interop
            return self
        raise VulkanUnavailable("no Vulkan device meets the requirements (" + "; ".join(reasons) + "): "
                                + INSTALL_HINT)

    def _create_device(self, info: DeviceInfo, family: int, exts: list[str]):
        vk = self.vk
        priorities = vk.ffi.new("float[]", [1.0])
        queue_info = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=family, queueCount=1, pQueuePriorities=priorities)
        f12 = vk.VkPhysicalDeviceVulkan12Features(timelineSemaphore=vk.VK_TRUE)
        features2 = vk.VkPhysicalDeviceFeatures2(pNext=f12)
        create_info = vk.VkDeviceCreateInfo(pNext=features2, queueCreateInfoCount=1, pQueueCreateInfos=[queue_info],
                                            enabledExtensionCount=len(exts), ppEnabledExtensionNames=exts or None)
        self.device = vk.vkCreateDevice(info.physical_device, create_info, None)
        self.physical_device = info.physical_device
        self.info = info
        self.queue_family = family
        self.queue = vk.vkGetDeviceQueue(self.device, family, 0)
        self.memory_properties = vk.vkGetPhysicalDeviceMemoryProperties(info.physical_device)
        # the properties kept: .limits is a view into them (read after they are freed it gave 0 for every limit)
        self.properties = vk.vkGetPhysicalDeviceProperties(info.physical_device)
        self.limits = self.properties.limits
        pool_info = vk.VkCommandPoolCreateInfo(flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                               queueFamilyIndex=family)
        self.command_pool = vk.vkCreateCommandPool(self.device, pool_info, None)

    @property
    def device_name(self) -> str:
        return self.info.name if self.info else "(no device)"

    @property
    def is_cpu_device(self) -> bool:
        return bool(self.info) and self.info.device_type == self.vk.VK_PHYSICAL_DEVICE_TYPE_CPU

    # ---- ownership and teardown ------------------------------------------------------------------------
    def own(self, closer):
        """Register ``closer`` (an object with ``close()`` or a callable) to be closed before the device goes."""
        self._owned.append(closer)
        return closer

    def disown(self, closer):
        try:
            self._owned.remove(closer)
        except ValueError:
            pass

    def wait_idle(self):
        """vkDeviceWaitIdle: only for teardown and rebuilds (never in the frame loop)."""
        if self.device is not None:
            self.vk.vkDeviceWaitIdle(self.device)

    def close(self):
        """Destroy everything in reverse order of creation: owned objects, command pool, device, messenger,
        instance. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        vk = self.vk
        if self.device is not None:
            vk.vkDeviceWaitIdle(self.device)
        while self._owned:
            o = self._owned.pop()
            (o.close if hasattr(o, "close") else o)()
        if self.command_pool is not None:
            vk.vkDestroyCommandPool(self.device, self.command_pool, None)
            self.command_pool = None
        if self.device is not None:
            vk.vkDestroyDevice(self.device, None)
            self.device = None
        if self.messenger is not None:
            self.instance_fn("vkDestroyDebugUtilsMessengerEXT")(self.instance, self.messenger, None)
            self.messenger = None
        if self.instance is not None:
            vk.vkDestroyInstance(self.instance, None)
            self.instance = None
        self._fns.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- memory ------------------------------------------------------------------------------------------
    def find_memory_type(self, type_bits: int, flags: int) -> int:
        mp = self.memory_properties
        for i in range(mp.memoryTypeCount):
            if type_bits & (1 << i) and (mp.memoryTypes[i].propertyFlags & flags) == flags:
                return i
        raise VulkanUnavailable(f"{self.device_name} has no memory type with flags 0x{flags:x} for this resource")

    def create_buffer(self, size: int, usage: int, *, host_visible: bool = True, export_fd: bool = False) -> Buffer:
        """A buffer of ``size`` bytes with its own memory.

        host_visible: HOST_VISIBLE | HOST_COHERENT memory, mapped for its whole life (``Buffer.mapped``);
            otherwise DEVICE_LOCAL. export_fd: allocated exportable as ``OPAQUE_FD``
            (VkExternalMemoryBufferCreateInfo + VkExportMemoryAllocateInfo; a dedicated allocation when the
            driver requires one) for import into CUDA.
        """
        vk = self.vk
        size = max(int(size), 4)
        handle_type = vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT
        ext_info = vk.VkExternalMemoryBufferCreateInfo(handleTypes=handle_type) if export_fd else None
        info = vk.VkBufferCreateInfo(pNext=ext_info, size=size, usage=usage,
                                     sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)
        buf = vk.vkCreateBuffer(self.device, info, None)
        req = vk.vkGetBufferMemoryRequirements(self.device, buf)
        flags = (vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) if host_visible \
            else vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
        dedicated = False
        export_info = dedicated_info = None
        if export_fd:
            dedicated = self._export_needs_dedicated(usage)
            dedicated_info = vk.VkMemoryDedicatedAllocateInfo(buffer=buf) if dedicated else None
            export_info = vk.VkExportMemoryAllocateInfo(pNext=dedicated_info, handleTypes=handle_type)
        alloc = vk.VkMemoryAllocateInfo(pNext=export_info, allocationSize=req.size,
                                        memoryTypeIndex=self.find_memory_type(req.memoryTypeBits, flags))
        try:
            mem = vk.vkAllocateMemory(self.device, alloc, None)
        except vk.VkError:
            vk.vkDestroyBuffer(self.device, buf, None)
            raise
        vk.vkBindBufferMemory(self.device, buf, mem, 0)
        mapped = vk.vkMapMemory(self.device, mem, 0, size, 0) if host_visible else None
        return Buffer(self, buf, mem, size, int(req.size), mapped, export_fd, dedicated)

    def _export_needs_dedicated(self, usage: int) -> bool:
        vk = self.vk
        info = vk.VkPhysicalDeviceExternalBufferInfo(usage=usage,
                                                     handleType=vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT)
        props = vk.VkExternalBufferProperties()
        vk.vkGetPhysicalDeviceExternalBufferProperties(self.physical_device, info, props)
        feats = props.externalMemoryProperties.externalMemoryFeatures
        if not feats & vk.VK_EXTERNAL_MEMORY_FEATURE_EXPORTABLE_BIT:
            raise VulkanUnavailable(f"{self.device_name} cannot export buffer memory as an opaque fd")
        return bool(feats & vk.VK_EXTERNAL_MEMORY_FEATURE_DEDICATED_ONLY_BIT)

    def memory_fd(self, buffer: Buffer) -> int:
        """A new POSIX fd of an exportable buffer's memory (``vkGetMemoryFdKHR``); the caller owns it."""
        vk = self.vk
        info = vk.VkMemoryGetFdInfoKHR(memory=buffer.memory, handleType=vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT)
        return int(self.device_fn("vkGetMemoryFdKHR")(self.device, info))

    def create_image(self, width: int, height: int, fmt: int, usage: int) -> Image:
        """A device-local 2D image (1 mip, 1 layer, optimal tiling) with a colour view."""
        vk = self.vk
        info = vk.VkImageCreateInfo(imageType=vk.VK_IMAGE_TYPE_2D, format=fmt,
                                    extent=vk.VkExtent3D(width=width, height=height, depth=1), mipLevels=1,
                                    arrayLayers=1, samples=vk.VK_SAMPLE_COUNT_1_BIT,
                                    tiling=vk.VK_IMAGE_TILING_OPTIMAL, usage=usage,
                                    sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE,
                                    initialLayout=vk.VK_IMAGE_LAYOUT_UNDEFINED)
        img = vk.vkCreateImage(self.device, info, None)
        req = vk.vkGetImageMemoryRequirements(self.device, img)
        alloc = vk.VkMemoryAllocateInfo(allocationSize=req.size, memoryTypeIndex=self.find_memory_type(
            req.memoryTypeBits, vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT))
        mem = vk.vkAllocateMemory(self.device, alloc, None)
        vk.vkBindImageMemory(self.device, img, mem, 0)
        view = self.create_view(img, fmt)
        return Image(self, img, mem, view, width, height, fmt)

    def create_view(self, image, fmt: int):
        vk = self.vk
        rng = vk.VkImageSubresourceRange(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, baseMipLevel=0, levelCount=1,
                                         baseArrayLayer=0, layerCount=1)
        info = vk.VkImageViewCreateInfo(image=image, viewType=vk.VK_IMAGE_VIEW_TYPE_2D, format=fmt,
                                        subresourceRange=rng)
        return vk.vkCreateImageView(self.device, info, None)

    # ---- semaphores and commands --------------------------------------------------------------------------
    def create_timeline_semaphore(self, initial: int = 0, *, export_fd: bool = False):
        """A timeline semaphore (VkSemaphoreTypeCreateInfo), exportable as OPAQUE_FD when ``export_fd``."""
        vk = self.vk
        export = vk.VkExportSemaphoreCreateInfo(handleTypes=vk.VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT) \
            if export_fd else None
        type_info = vk.VkSemaphoreTypeCreateInfo(pNext=export, semaphoreType=vk.VK_SEMAPHORE_TYPE_TIMELINE,
                                                 initialValue=initial)
        return vk.vkCreateSemaphore(self.device, vk.VkSemaphoreCreateInfo(pNext=type_info), None)

    def create_binary_semaphore(self):
        return self.vk.vkCreateSemaphore(self.device, self.vk.VkSemaphoreCreateInfo(), None)

    def semaphore_fd(self, semaphore) -> int:
        """A new POSIX fd of an exportable semaphore (``vkGetSemaphoreFdKHR``); the caller owns it."""
        vk = self.vk
        info = vk.VkSemaphoreGetFdInfoKHR(semaphore=semaphore,
                                         handleType=vk.VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT)
        return int(self.device_fn("vkGetSemaphoreFdKHR")(self.device, info))

    def wait_timeline(self, semaphore, value: int, timeout_ns: int = UINT64_MAX) -> bool:
        """Host wait until ``semaphore`` ≥ ``value``; False on timeout. Waits on one slot's or one frame's
        semaphore only (never the whole queue).

        Per-frame path: plain cffi structs and the loader's entry point (``vk.lib``), no binding struct
        constructor (those cost tens of µs of Python each)."""
        if value <= 0:
            return True
        vk = self.vk
        ffi = vk.ffi
        sems = ffi.new("VkSemaphore[1]", [semaphore])
        vals = ffi.new("uint64_t[1]", [int(value)])
        info = ffi.new("VkSemaphoreWaitInfo*", {"sType": vk.VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO,
                                               "semaphoreCount": 1, "pSemaphores": sems, "pValues": vals})
        res = vk.lib.vkWaitSemaphores(self.device, info, int(timeout_ns))
        if res == vk.VK_TIMEOUT:
            return False
        check_result(vk, res, "vkWaitSemaphores")
        return True

    def signal_timeline(self, semaphore, value: int):
        """Host signal (``vkSignalSemaphore``): the CPU path, where the renderer runs on the host."""
        vk = self.vk
        info = vk.ffi.new("VkSemaphoreSignalInfo*", {"sType": vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO,
                                                     "semaphore": semaphore, "value": int(value)})
        check_result(vk, vk.lib.vkSignalSemaphore(self.device, info), "vkSignalSemaphore")

    def timeline_value(self, semaphore) -> int:
        """The semaphore's current value (``vkGetSemaphoreCounterValue``; never blocks). Polled per frame, so
        the output cell is allocated once."""
        vk = self.vk
        out = self._c_counter
        check_result(vk, vk.lib.vkGetSemaphoreCounterValue(self.device, semaphore, out), "vkGetSemaphoreCounterValue")
        return int(out[0])

    def allocate_command_buffers(self, n: int) -> list:
        vk = self.vk
        info = vk.VkCommandBufferAllocateInfo(commandPool=self.command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                              commandBufferCount=n)
        cbs = vk.vkAllocateCommandBuffers(self.device, info)
        return [cbs[i] for i in range(n)]

    def free_command_buffers(self, cbs: list):
        if cbs and self.device is not None:
            self.vk.vkFreeCommandBuffers(self.device, self.command_pool, len(cbs), cbs)

    def run_once(self, record):
        """Record with ``record(cmd)``, submit, and wait on a fence: setup-time uploads only (font atlas,
        colormap), never per frame."""
        vk = self.vk
        (cmd,) = self.allocate_command_buffers(1)
        fence = vk.vkCreateFence(self.device, vk.VkFenceCreateInfo(), None)
        try:
            vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
                flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
            record(cmd)
            vk.vkEndCommandBuffer(cmd)
            cmds = vk.ffi.new("VkCommandBuffer[]", [cmd])
            submit = vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=cmds)
            vk.vkQueueSubmit(self.queue, 1, [submit], fence)
            vk.vkWaitForFences(self.device, 1, [fence], vk.VK_TRUE, UINT64_MAX)
        finally:
            vk.vkDestroyFence(self.device, fence, None)
            self.free_command_buffers([cmd])
