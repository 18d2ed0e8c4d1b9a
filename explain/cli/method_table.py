"""The table ``explain methods`` prints, kept as text so that the command answers without
importing torch and the methods (``tests/test_cli.py`` checks it against the registry).
Regenerate it after adding or changing a method: ``python -m explain.cli.listing``."""

METHOD_TABLE = """\
method               family                    layer  cost per image and target                                           
gradcam              gradient CAM              yes    1 forward + 1 backward to the layer                                 Grad-CAM: activations weighted by their spatially averaged gradients.
gradcam++            gradient CAM              yes    1 forward + 1 backward to the layer                                 Grad-CAM++: per-pixel weighting of positive gradients by higher-order terms.
xgradcam             gradient CAM              yes    1 forward + 1 backward to the layer                                 XGrad-CAM: gradients averaged with the activations' own spatial weights.
hirescam             gradient CAM              yes    1 forward + 1 backward to the layer                                 HiResCAM: element-wise gradient times activation, summed over channels.
layercam             gradient CAM              yes    1 forward + 1 backward to the layer                                 LayerCAM: activations weighted location by location by their positive gradients.
gradcam-elementwise  gradient CAM              yes    1 forward + 1 backward to the layer                                 Grad-CAM element-wise: ReLU of gradient times activation, then summed over channels.
eigengradcam         gradient CAM              yes    1 forward + 1 backward to the layer                                 EigenGrad-CAM: first principal component of gradient times activation.
smoothgradcam++      gradient CAM              yes    1 forward + n_samples (4) forward + backward to the layer           SmoothGrad-CAM++: Grad-CAM++ with its derivatives averaged over noisy copies of the input.
shapleycam           gradient CAM              yes    1 forward + 1 double backward to the layer                          Shapley-CAM: Grad-CAM with a second-order correction from the Hessian.
finercam             gradient CAM              yes    1 forward + 1 backward to the layer                                 Finer-CAM: a gradient CAM of the target's score against its most similar classes.
cam                  gradient-free CAM         yes    1 forward                                                           CAM: activations weighted by the classifier's weights for the class.
eigencam             gradient-free CAM         yes    1 forward                                                           Eigen-CAM: the first principal component of the activations.
kpcacam              gradient-free CAM         yes    1 forward                                                           KPCA-CAM: the first kernel principal component of the activations.
fem                  gradient-free CAM         yes    1 forward                                                           FEM (feature explanation method): channels weighted by how often they fire strongly.
randomcam            gradient-free CAM         yes    1 forward                                                           Random-CAM: activations weighted by random numbers, a baseline for sanity checks.
scorecam             perturbation CAM          yes    1 + C forward (C channels at the layer)                             Score-CAM: channels weighted by the class probability of the image masked by them.
sscam                perturbation CAM          yes    1 + C x n_samples (35) forward                                      SS-CAM: Score-CAM with each channel's score averaged over noisy masks.
iscam                perturbation CAM          yes    1 + C x n_samples (10) forward                                      IS-CAM: Score-CAM with each channel's score integrated along a path of growing masks.
ablationcam          perturbation CAM          yes    1 + C forward (C channels at the layer)                             Ablation-CAM: channels weighted by the relative drop of the score when zeroed.
fullgrad             gradient CAM              -      1 forward + 1 backward                                              FullGrad: full-gradient saliency, the input-gradient plus every layer's bias-gradient.
saliency             gradient attribution      -      1 forward + 1 backward                                              Saliency: the gradient of the score with respect to the input, dS/dx.
inputxgrad           gradient attribution      -      1 forward + 1 backward                                              Input x Gradient: x * dS/dx, each input's first-order contribution to the score.
smoothgrad           gradient attribution      -      1 forward + n_samples (50) forward + backward                       SmoothGrad: the input gradient averaged over noisy copies of the image.
vargrad              gradient attribution      -      1 forward + n_samples (50) forward + backward                       VarGrad: the variance of the input gradient over noisy copies of the image.
ig                   gradient attribution      -      1 forward + n_steps (50) forward + backward                         Integrated Gradients: the gradient integrated along a path from a baseline.
guidedbp             gradient attribution      -      1 forward + 1 backward                                              Guided Backprop: the gradient with negative gradients stopped at every ReLU.
deconv               gradient attribution      -      1 forward + 1 backward                                              Deconvolution: the gradient passed through a ReLU of itself at every ReLU.
guidedgradcam        gradient attribution      yes    2 forward + 2 backward (one to the layer)                           Guided Grad-CAM: Guided Backprop times the upsampled Grad-CAM map.
deeplift             gradient attribution      -      1 forward + backward of 2 rows                                      DeepLift: contributions to S(x) - S(x') by the rescale rule.
deepliftshap         gradient attribution      -      1 forward + 1 forward + backward of 2 x n_baselines (16) rows       DeepLiftShap: DeepLift averaged over a distribution of baselines (SHAP values).
gradientshap         gradient attribution      -      1 forward + n_samples (50) forward + backward                       GradientShap: expected gradients over baselines from a distribution (SHAP values).
occlusion            perturbation attribution  -      2 + 169 forward at 224 x 224 (window 32, stride 16)                 Occlusion: the drop in the score when a sliding square is replaced by the baseline.
lime                 perturbation attribution  -      1 + n_samples (256) forward                                         LIME: a sparse linear model of the score over superpixels switched on and off.
kernelshap           perturbation attribution  -      1 + n_samples (256) forward                                         KernelSHAP: Shapley values of superpixels, from a kernel-weighted linear model.
ablation             perturbation attribution  -      2 + n_segments (~50) forward                                        Feature Ablation: the drop in the score when one superpixel is replaced by the baseline.
lrp                  gradient attribution      -      3 forward + 1 backward, each layer rerun about 8 times by its rule  Layer-wise Relevance Propagation (LRP): the score handed back to the pixels, layer by layer.
attention-rollout    transformer attention     -      1 forward                                                           Attention rollout: how much each patch token flows into the class token, through the
attention-relevance  transformer attention     -      1 forward + 1 backward to the first attention                       Gradient-weighted attention relevance: each layer's attention, weighted by its
legrad               transformer attention     -      1 forward + 1 backward per layer to its attention                   LeGrad: the sensitivity of each layer's prediction to that layer's attention.
"""
